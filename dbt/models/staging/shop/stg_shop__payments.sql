with

source as (

    select * from {{ source('shop', 'shop_events') }}
    where event_type = 'payment_captured'

),

renamed as (

    select
        event_id as payment_id,
        order_id,
        customer_id,
        currency,
        amount,
        event_time as captured_at

    from source

)

select * from renamed
