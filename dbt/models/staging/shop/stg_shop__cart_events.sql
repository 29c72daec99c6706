with

source as (

    select * from {{ source('shop', 'shop_events') }}
    where event_type in ('cart_item_added', 'cart_item_removed')

),

renamed as (

    select
        event_id as cart_event_id,
        customer_id,
        product_id,
        case event_type
            when 'cart_item_added' then 'added'
            else 'removed'
        end as action,
        quantity,
        event_time as occurred_at

    from source

)

select * from renamed
