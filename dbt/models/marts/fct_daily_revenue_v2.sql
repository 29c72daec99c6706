-- v2: net of cancellations attributed to the order's day, as revenue_hourly v2
-- means it.
with

orders as (

    select * from {{ ref('fct_orders') }}

),

final as (

    select
        placed_date as revenue_date,
        currency,
        count(*) as orders_placed,
        count_if(is_cancelled) as orders_cancelled,
        cast(sum(order_total) as decimal(18, 2)) as gross_revenue,
        cast(sum(cancelled_total) as decimal(18, 2)) as cancelled_revenue,
        cast(
            sum(order_total) - sum(cancelled_total) as decimal(18, 2)
        ) as net_revenue

    from orders
    group by placed_date, currency

)

select * from final
