with

source as (

    select * from {{ source('shop', 'shop_events') }}
    where event_type = 'order_cancelled'

),

renamed as (

    select
        event_id as cancellation_id,
        order_id,
        customer_id,
        reason as cancellation_reason,
        event_time as cancelled_at

    from source

)

select * from renamed
